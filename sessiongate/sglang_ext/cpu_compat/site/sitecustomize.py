"""Installs sessiongate's CPU compatibility hooks at the start of every worker process.

`sglang_ext.launcher` prepends this directory to PYTHONPATH for SGLang workers on machines without
CUDA; Python imports `sitecustomize` at start-up, and SGLang's scheduler and detokenizer processes
inherit the environment, so each of them runs this too. It only installs import hooks (see
`sglang_ext.cpu_compat`): torch and sglang are patched when, and if, they are imported.
"""

from sessiongate.sglang_ext.cpu_compat import activate_from_environ

activate_from_environ()
