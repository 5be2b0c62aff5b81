"""Distributed inference in the daemon: block servers, chains of them, generation."""
