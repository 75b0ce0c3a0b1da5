"""The driver: validated config -> Ray Train's configs -> ``TorchTrainer.fit`` -> the run dir's files."""
