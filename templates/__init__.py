"""Jinja templates and phrase catalogs of symparam.render, installed as the package symparam.templates."""
