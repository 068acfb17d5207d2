"""Version of the vendor-flash package."""

__version__ = "0.1.0"
