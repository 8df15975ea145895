"""The peers of benchmarks/pfl.py: the shared workloads, the pfl side and the plain serial loop (not a raysim
package: pfl_app.py runs in benchmarks/.pfl-venv, which has no raysim, with this folder as its import root)."""
