"""Search: sketches, candidate populations, learned cost models and the search policy."""
