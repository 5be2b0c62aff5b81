"""Agents with different skills and quality: does routing to the right specialist improve as
LinUCB learns from outcomes, against score-only selection, on the same tasks?

population.py builds the agents (their cards' skills and description vectors, their true
quality per skill) and the task stream; routing.py routes it with each selector through the
daemon's own match rule, screening and selectors, and reports (``run_agents_scenario``).
"""

from simulations.agents.routing import run_agents_scenario

__all__ = ["run_agents_scenario"]
