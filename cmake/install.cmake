# `cmake --install BUILD --prefix P`: the tools in P/bin, the data they read at run time in
# P/share/ds4cpp under the same relative paths as in the source tree (docs/ARCHITECTURE.md,
# "Install layout"). tools/common/repo_paths finds that data from the binary's own location, so
# the prefix can be moved as a whole.
include(GNUInstallDirs)

set(DS4_INSTALL_DATA_DIR "${CMAKE_INSTALL_DATADIR}/ds4cpp")

# The data folder seen from the binaries' folder, e.g. "../share/ds4cpp".
file(RELATIVE_PATH _ds4_data_rel "/prefix/${CMAKE_INSTALL_BINDIR}" "/prefix/${DS4_INSTALL_DATA_DIR}")
if(TARGET ds4tools)
    target_compile_definitions(ds4tools PRIVATE DS4_INSTALL_DATA_REL="${_ds4_data_rel}")
endif()

# The tools a user runs (build/bin also holds unit tests and micro-benchmarks: not installed).
set(_ds4_install_tools ds4 ds4-test ds4-bench ds4-server ds4-mkmodel ds4-quantize ds4-gguf-dump)
foreach(_t IN LISTS _ds4_install_tools)
    if(TARGET ${_t})
        install(TARGETS ${_t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    endif()
endforeach()

# The converter: the shell wrapper runs the Python script that sits beside it.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/convert/ds4-convert ${PROJECT_SOURCE_DIR}/tools/convert/ds4_convert.py
        DESTINATION ${CMAKE_INSTALL_BINDIR})

# Data read at run time:
#   models/ds4-vocab.gguf          default --vocab of ds4-mkmodel and ds4-test
#   models/promessi-mini-q8_0.gguf default model of ds4-test --backend-parity (trained, tiny)
#   tests/test-vectors/            default --vector-file of ds4-test, with its prompts and the
#                                  official JSON beside it
#   tests/model/fixtures/          default --fixtures-dir of ds4-test (index.json, logits and the
#                                  committed GGUFs; the safetensors checkpoints are only inputs of
#                                  the Python converter tests)
install(FILES ${PROJECT_SOURCE_DIR}/models/ds4-vocab.gguf ${PROJECT_SOURCE_DIR}/models/promessi-mini-q8_0.gguf
        DESTINATION ${DS4_INSTALL_DATA_DIR}/models)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tests/test-vectors DESTINATION ${DS4_INSTALL_DATA_DIR}/tests
        PATTERN "*.py" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tests/model/fixtures DESTINATION ${DS4_INSTALL_DATA_DIR}/tests/model
        PATTERN "*.safetensors" EXCLUDE)

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md")
