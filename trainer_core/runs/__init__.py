"""The top layer: the run registry (registry.py), headless `train`, run files, the diffusion-pipe importer, the demo and the command line."""
