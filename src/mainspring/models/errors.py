"""The error of a model that cannot be served (its own module: the repository, Triton's config reader
and the ONNX loader all raise it, and none of them may import another for it)."""


class ModelLoadError(ValueError):
    """A model that cannot be served: names the model, the file and the reason."""
