"""Widgets that render the cluster model; none of them talks to the master."""
