"""Evaluation: top-K ranking metrics (no torch), witness-rate protocol, tables and plots."""
