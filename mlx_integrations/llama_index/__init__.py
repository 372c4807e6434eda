"""llama_index"""
