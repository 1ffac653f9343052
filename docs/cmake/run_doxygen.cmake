# Runs Doxygen on a fresh html/ (no page of a removed chapter or symbol survives), then copies the MathJax
# files the pages load into html/mathjax. WARN_AS_ERROR=FAIL_ON_WARNINGS: Doxygen reports every warning, then fails.
#   cmake -DDOXYGEN=<doxygen> -DDOXYFILE=<Doxyfile> -DHTML_DIR=<html> -DMATHJAX_DIR=<libjs-mathjax>
#         -DSTAMP=<file> -DPAGES_DIR=<generated pages> -DTUTORIALS_DIR=<tutorials> -P run_doxygen.cmake
cmake_minimum_required(VERSION 3.25)  # script mode: today's policies (empty list elements kept)
file(REMOVE ${STAMP})
file(REMOVE_RECURSE ${HTML_DIR})
execute_process(COMMAND ${DOXYGEN} ${DOXYFILE} RESULT_VARIABLE status OUTPUT_VARIABLE printed ERROR_VARIABLE printed)
if(printed)
    # A warning in a generated chapter page names the chapter's own file.
    string(REGEX REPLACE "${PAGES_DIR}/tutorial_([A-Za-z0-9_]+)\\.md" "${TUTORIALS_DIR}/\\1/chapter.md"
                         printed "${printed}")
    message("${printed}")
endif()
if(NOT status EQUAL 0)
    message(FATAL_ERROR "docs: Doxygen failed (${status}). The project allows no documentation warnings: "
                        "document every name listed above (file:line), or fix the markup.")
endif()

# MathJax 2.7 with the SVG output (no web fonts, so it works from file:// in every browser): the loader, the
# TeX input, the SVG output and its TeX fonts, the extensions, the English strings. 2 MB of the package's 54 MB.
set(mathjax ${HTML_DIR}/mathjax)
file(MAKE_DIRECTORY ${mathjax}/jax/output/SVG/fonts ${mathjax}/jax/element ${mathjax}/jax/input ${mathjax}/localization)
file(COPY ${MATHJAX_DIR}/MathJax.js ${MATHJAX_DIR}/extensions DESTINATION ${mathjax})
file(COPY ${MATHJAX_DIR}/jax/input/TeX DESTINATION ${mathjax}/jax/input)
file(COPY ${MATHJAX_DIR}/jax/element/mml DESTINATION ${mathjax}/jax/element)
file(COPY ${MATHJAX_DIR}/jax/output/SVG/jax.js ${MATHJAX_DIR}/jax/output/SVG/config.js
          ${MATHJAX_DIR}/jax/output/SVG/autoload DESTINATION ${mathjax}/jax/output/SVG)
file(COPY ${MATHJAX_DIR}/jax/output/SVG/fonts/TeX DESTINATION ${mathjax}/jax/output/SVG/fonts)
file(COPY ${MATHJAX_DIR}/localization/en DESTINATION ${mathjax}/localization)
if(NOT EXISTS ${HTML_DIR}/index.html OR NOT EXISTS ${mathjax}/MathJax.js)
    message(FATAL_ERROR "docs: Doxygen ran but ${HTML_DIR}/index.html or the MathJax copy is missing")
endif()
file(TOUCH ${STAMP})
