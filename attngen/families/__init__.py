"""Attention families: one package each (``mha``, ``mla``, ``gdn``, ``dsa``).

A family package registers its :class:`attngen.registry.FamilyInfo` (docs columns, plainest
variant, arch needs); its ``<backend>/`` subpackages register the lowerings of that family
for a kernel backend. See docs/architecture.md.
"""
