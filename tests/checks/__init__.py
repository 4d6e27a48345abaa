"""The checks of each notebook: references, visible and hidden checks, the mistake catalogues, the wire."""
