"""Chat core: messages, chat templates, tool-call parsing, reasoning and constraints.

Framework-neutral; both adapters stand on it.
"""
