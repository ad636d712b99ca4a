from setuptools import find_packages, setup

setup(
    name="blueque",
    version="2.0.0.dev0",
    description="A Redis job queue for very long jobs, wire-compatible with blueque 1.0.1",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",  # tomllib (cron files), fromisoformat with "Z" (--eta)
    packages=find_packages(include=["blueque", "blueque.*"]),
    package_data={"blueque": ["lua/*.lua", "py.typed"],
                  "blueque.web": ["templates/*.html", "static/*"]},
    install_requires=[
        "redis>=5.0.1",
        "psutil>=5.9",
        "croniter>=2.0",
        "setproctitle>=1.3",
        "prometheus_client>=0.17",
    ],
    extras_require={
        # hiredis: redis-py parses replies in C; measured 12% less client CPU per enqueue
        "fast": ["hiredis>=2.0"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "fakeredis>=2.20",
            "lupa>=2.0",
            "ruff>=0.6",
            "mypy>=1.10",
            "types-psutil",
            "httpx>=0.24",
            # blueque.aio's tests: anyio's pytest plugin; examples/fastapi_service.py; the
            # dashboard mounted in a FastAPI service (test_dashboard)
            "anyio>=4",
            "fastapi>=0.110",
            "playwright>=1.40",
            "starlette>=0.37",
            "uvicorn>=0.23",
            "jinja2>=3.1",
            "setuptools>=61",  # test_dashboard builds the package (venvs of 3.12+ lack it)
        ],
        "spark": ["pyspark>=3.5"],
        "web": ["starlette>=0.37", "uvicorn>=0.23", "jinja2>=3.1", "prometheus_client>=0.17"],
    },
    entry_points={"console_scripts": ["blueque=blueque.cli:main"]},
    scripts=[],
)
