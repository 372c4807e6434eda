"""langchain"""
