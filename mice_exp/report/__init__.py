"""Reports: figures (and tables) built from results; matplotlib only, no pyplot state."""
