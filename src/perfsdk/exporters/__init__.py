"""Built-in exporters and the flattening they share."""
