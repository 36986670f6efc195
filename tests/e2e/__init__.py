"""The README's demo, end to end."""
