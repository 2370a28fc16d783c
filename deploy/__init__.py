"""Deployment of the playground: Hugging Face Space folders per target (`python -m deploy space --target ...`).

Modules: `targets` (what each Space target needs), `space` (writes a folder), `cli` (the command line).
"""
