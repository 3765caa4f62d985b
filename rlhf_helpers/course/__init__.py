"""The course around the notebooks: their standard header (`notebook`), the Colab set-up cell's logic
(`colab_setup`) and `make course` (`run_course`)."""
