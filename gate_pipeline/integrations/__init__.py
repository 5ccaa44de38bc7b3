"""Adapters from gate to other evaluation frameworks (optional extras; gate's core never imports them)."""
