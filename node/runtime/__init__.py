"""The driver's parts (node/driver.py runs them): what leaves this node, and how.

* ``unicast.py``: one ordered, bounded outbox per peer and service; every ``Send`` is one
  request whose response is an ack, and every failure comes back to the sending machine as
  ``SendFailed``.
* ``publish.py``: one bounded queue of gossip publishes, published in order, best effort.

Nothing is re-exported here: import from the module that defines it.
"""
