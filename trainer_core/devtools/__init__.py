"""Developer tooling: memory probes, random-weight model builders, the tiny-model file exporter.

Used by the tests, `benchmarks/`, `tools/` and the CLI's `export-tiny` (imported there lazily), never
by the nodes or the training path: what ComfyUI imports at run time stays the engine alone, and a tool
here may import whatever it needs (torch's dispatch internals, every file writer) without weighing on
it. `tests/house/test_layout.py` checks that nothing the pack imports reaches this package.
"""
