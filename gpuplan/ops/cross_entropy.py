"""(family cross_entropy: being implemented)."""

__all__: list[str] = []
__functional__: list[str] = []
