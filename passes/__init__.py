"""wide_compile.passes"""
