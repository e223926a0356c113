"""OpenSim musculoskeletal environments: NeurIPS 2018 AI for Prosthetics and NeurIPS 2019 Learn
to Move, gymnasium-native, on the PyPI ``opensim`` wheel with the model files of ``osim-rl``."""
