"""Benchmarks: mirrorflow vs MirrorMaker 2 vs a raw consume->produce pipe (see bench/README.md)."""
