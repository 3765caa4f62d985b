#!/usr/bin/env bash
# Wheels for tools/gpu_checks.sh on a CUDA machine that has torch, transformers, peft and accelerate
# but no package index (Python 3.12, x86-64): .whl/ (trl 1.16, datasets, plotly, ipywidgets and the
# Jupyter kernel stack that runs the notebooks) and .whl110/ (trl 1.10.0 alone: the TRL-baseline side).
# Versions are constraints.txt's. Both folders are ~30 MB and belong in .git/info/exclude.
#
#   bash tools/fetch_gpu_wheels.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${1:-3.12}"
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
           manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${tag}_x86_64")
done
pin() { grep -i -E "^$1==" constraints.txt; }  # the tested version of a package
main=(trl datasets dill multiprocess plotly ipywidgets widgetsnbextension jupyterlab_widgets comm anywidget
      psygnal nbclient nbformat ipykernel jupyter_client jupyter_core traitlets tornado pyzmq ipython
      ipython_pygments_lexers jedi parso matplotlib-inline debugpy nest-asyncio2 prompt_toolkit wcwidth
      pexpect ptyprocess stack-data asttokens executing pure_eval fastjsonschema jsonschema
      jsonschema-specifications referencing rpds-py platformdirs)
specs=()
for name in "${main[@]}"; do specs+=("$(pin "$name")"); done

mkdir -p .whl .whl110
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d .whl "${specs[@]}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d .whl110 trl==1.10.0
grep -qxF /.whl/ .git/info/exclude 2>/dev/null || printf '/.whl/\n/.whl110/\n' >> .git/info/exclude
du -sh .whl .whl110
