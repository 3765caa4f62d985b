"""The training command's run files: the folder's pre-flight and exit codes
(`run_folder`), the experiment trackers (`tracking`) and the curves page (`curves_page`).
"""
