"""The built-in demo models (random weights in real architectures), built locally."""
