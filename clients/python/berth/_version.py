# Set by scripts/python-sdk.sh from berth's version (git describe) when it
# builds the wheel; a source checkout says 0.0.0+dev.
__version__ = "0.0.0+dev"
