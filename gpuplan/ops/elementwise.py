"""(family elementwise: being implemented)."""

__all__: list[str] = []
__functional__: list[str] = []
