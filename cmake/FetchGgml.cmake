# codecrt_resolve_ggml(<out_var>)
#
# Sets <out_var> to a ggml source tree (the directory holding ggml's
# CMakeLists.txt), in this order:
#   1. the cache variable CODECRT_GGML_DIR, if set;
#   2. the environment variable CODECD_GGML_DIR, if set;
#   3. the vendor/ggml tree of the PyPI sdist ggml-python==CODECRT_GGML_PYPI_VERSION,
#      downloaded with pip, checked against CODECRT_GGML_PYPI_SHA256 and cached
#      under ${CODECD_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/codecd}/ggml/
#      by cmake/fetch_ggml.py (which re-verifies the cached tarball every time).
function(codecrt_resolve_ggml out_var)
    if(CODECRT_GGML_DIR)
        set(_dir "${CODECRT_GGML_DIR}")
        set(_how "CODECRT_GGML_DIR")
    elseif(DEFINED ENV{CODECD_GGML_DIR} AND NOT "$ENV{CODECD_GGML_DIR}" STREQUAL "")
        set(_dir "$ENV{CODECD_GGML_DIR}")
        set(_how "CODECD_GGML_DIR")
    else()
        if(NOT Python_Interpreter_FOUND)
            message(FATAL_ERROR
                "codecrt: a Python interpreter is needed to fetch ggml "
                "(or set CODECRT_GGML_DIR / CODECD_GGML_DIR to a ggml source tree)")
        endif()
        execute_process(
            COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/fetch_ggml.py"
                    --version "${CODECRT_GGML_PYPI_VERSION}"
                    --sha256 "${CODECRT_GGML_PYPI_SHA256}"
            RESULT_VARIABLE _rc
            OUTPUT_VARIABLE _out
            ERROR_VARIABLE _err
            OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(NOT _rc EQUAL 0)
            message(FATAL_ERROR "codecrt: fetching ggml failed (rc=${_rc}):\n${_err}\n"
                "Set CODECD_GGML_DIR (or -DCODECRT_GGML_DIR=...) to a ggml source tree "
                "to build without the registry.")
        endif()
        if(_err)
            message(STATUS "${_err}")
        endif()
        string(REGEX REPLACE ".*\n" "" _dir "${_out}")
        set(_how "ggml-python==${CODECRT_GGML_PYPI_VERSION} sdist (cached)")
    endif()
    get_filename_component(_dir "${_dir}" ABSOLUTE)
    if(NOT EXISTS "${_dir}/CMakeLists.txt")
        message(FATAL_ERROR "codecrt: ${_how}: '${_dir}' is not a ggml source tree "
            "(no CMakeLists.txt)")
    endif()
    message(STATUS "codecrt: ggml from ${_how}")
    set(${out_var} "${_dir}" PARENT_SCOPE)
endfunction()
