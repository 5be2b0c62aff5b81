"""`symphony doctor`: checks of a node's set-up, each with pass/fail and how to fix it.

* ``report.py``: a check's outcome (:class:`Check`) and the summary;
* ``local.py``: what needs no network: key, data dir, listen ports, model, disk and memory, GPU;
* ``network.py``: each bootstrap address resolved, dialled and asked for its network id, and
  what only the running daemon knows (reachability, NAT status and relay reservation, clock
  offset against peers);
* ``run.py``: every check in order for one node's config.
"""
