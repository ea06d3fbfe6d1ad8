"""Configuration: quantities declared by name, in Python or in a file."""
