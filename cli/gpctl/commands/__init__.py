"""One module per ``gpctl`` command; ``gpctl.main`` registers each with one line."""
