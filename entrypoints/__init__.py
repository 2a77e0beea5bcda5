"""The top floor: the `openft` command, the demo, and starting or joining Ray and Serve.

Nothing below imports from here; each entry point reads `Settings` and passes it down.
"""
