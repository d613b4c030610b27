"""Each benchmark's real annotation layouts (schema.Layout): the authors' release and the hub
dataset lmms-eval's built-in task reads, one module per benchmark, each naming the exact release
it follows. docs/DATA.md shows them all."""
