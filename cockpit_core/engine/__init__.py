"""The tracking engine: the Cockpit, its steps, and what runs inside them."""
