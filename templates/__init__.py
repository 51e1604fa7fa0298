"""wide_compile.templates"""
