"""tilecraft"""
