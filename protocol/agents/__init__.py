"""Agents on the network: signed agent cards (cards.py) and the one rule that matches a task's
need to a card, with Symphony-Coord's screening (matching.py)."""
