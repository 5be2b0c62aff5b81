"""What crosses the simulated network: frames and gossip, beneath simulations/transport.py.

* frames.py: a message's frame (its encoded bytes or the object itself), its size, opening it;
* gossip.py: gossip over each topic's mesh, planned floods for small frames and hop by hop
  for the rest;
* flood.py: the planner of those floods (a shortest-arrival-time problem solved in numpy).
"""
