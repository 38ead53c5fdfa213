"""Tuning: the loop that searches, measures and records, and how it reports progress."""
