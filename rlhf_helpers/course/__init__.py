"""The course around the notebooks: their standard header (`notebook`), the Colab set-up cell's
logic (`colab_setup`), the exercise checks (`exercises`), notebook 06's failure-mode lab
(`failure_runs`) and `make course` (`run_course`)."""
