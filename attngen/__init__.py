"""attngen: declarative attention-variant specs -> kernels, backends and a support matrix."""

__version__ = "0.1.0"
