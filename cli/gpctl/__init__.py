"""gpctl: the GrowPage command line for SREs; thin typer commands over ``growpage`` functions."""
