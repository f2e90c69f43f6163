"""A call's output, from the bytes a command writes to the text a model reads: captured
into its spill file and counted (`capture`), made clean text (`sanitize`), cut by the
dialect's policy with exact counts (`truncate`), Pi's input handling (`normalize`), and the
patterns callers grep output with (`patterns`). Pure functions except `capture`.
"""
