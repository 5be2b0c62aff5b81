"""Distributed inference: routing a chain over block servers, sessions, speculative decoding."""
