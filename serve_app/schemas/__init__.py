"""Wire schemas: pydantic models mirroring openai-python's objects field for field, plus `gridline`."""
