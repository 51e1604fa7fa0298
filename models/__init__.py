"""wide_compile.models"""
