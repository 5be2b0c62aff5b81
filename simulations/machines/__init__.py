"""Adapters that host each protocol/ machine on a virtual node (the simulator's services).

Each module builds a :class:`~simulations.node.MachineSpec` for one machine of protocol/:
how to construct it for a node (from the node's identity, rng and store), which messages and
topics route to it, and how its machine-specific effects are performed in the simulation.
They never re-implement protocol logic.
"""
