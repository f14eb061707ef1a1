# Sanitizer and fuzzing builds. Both apply to every target of the build, so
# the code a harness or test reaches is instrumented whichever library it is in.
#
#   POSENC_SANITIZE=address,undefined  ASan + UBSan, every UB finding fatal
#   POSENC_SANITIZE=thread             TSan (our own code; Debian's gRPC is not
#                                      instrumented, so keep TSan to tests that
#                                      do not run a gRPC server)
#   POSENC_BUILD_FUZZERS=ON            libFuzzer harnesses (clang only)
set(POSENC_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined or thread")
option(POSENC_BUILD_FUZZERS "Build the libFuzzer harnesses (needs clang)" OFF)
set(POSENC_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz.<name> test fuzzes from its corpus")

if(POSENC_SANITIZE)
  # Line tables only: a report's stack names file and line, which is all the
  # sanitizers' symbolizer reads. With -O1 (scripts/sanitize.sh) in place of
  # -O2 -g, clang compiled server/kserve/service.cc under ASan in 28.1 s
  # against 34.6.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${POSENC_SANITIZE};-fno-omit-frame-pointer>"
                      "$<$<COMPILE_LANG_AND_ID:CXX,Clang>:-gline-tables-only>"
                      "$<$<COMPILE_LANG_AND_ID:CXX,GNU>:-g1>")
  add_link_options(-fsanitize=${POSENC_SANITIZE})
  if(POSENC_SANITIZE MATCHES "undefined")
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>")
    add_link_options(-fno-sanitize-recover=undefined)
  endif()
  # The AVX2 clones' ifunc resolvers run before the sanitizer runtime starts
  # (TSan crashes at load); sanitizer builds check the clones' portable
  # version. The loops written in intrinsics are chosen by plain calls and
  # stay in (gcc only: scripts/sanitize.sh's third build).
  # Tests that measure memory or time skip those checks under sanitizers.
  add_compile_definitions(POSENC_NO_CLONES=1 POSENC_UNDER_SANITIZER=1)
endif()

if(POSENC_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "POSENC_BUILD_FUZZERS needs clang (CXX=clang++)")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()

# posenc_add_fuzzer(<name> SOURCES <src>... LIBS <lib>...)
#
# A harness is a source defining LLVMFuzzerTestOneInput. Its seed corpus is
# tests/fuzz/<name>/ and its dictionary tests/fuzz/<name>.dict (optional).
# Every build links it with a replay main as <name>_replay and runs the seed
# corpus through it (test fuzz_replay.<name>, label cpu), so gcc builds keep
# harnesses compiling and the corpus passing. With POSENC_BUILD_FUZZERS the
# libFuzzer binary <name> is built too, and test fuzz.<name> (label fuzz)
# fuzzes for POSENC_FUZZ_SECONDS from the corpus.
function(posenc_add_fuzzer name)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS" ${ARGN})
  set(corpus ${PROJECT_SOURCE_DIR}/tests/fuzz/${name})
  set(dict ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}.dict)

  add_executable(${name}_replay ${F_SOURCES} ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cc)
  target_link_libraries(${name}_replay PRIVATE ${F_LIBS})
  # Header-only test helpers (stand_in_device.h), without the test targets,
  # which a build without tests does not have.
  target_include_directories(${name}_replay PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  add_test(NAME fuzz_replay.${name} COMMAND ${name}_replay ${corpus})
  set_tests_properties(fuzz_replay.${name} PROPERTIES LABELS cpu TIMEOUT 300)

  if(POSENC_BUILD_FUZZERS)
    add_executable(${name} ${F_SOURCES})
    target_link_libraries(${name} PRIVATE ${F_LIBS})
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    add_test(NAME fuzz.${name}
             COMMAND ${PROJECT_SOURCE_DIR}/tests/fuzz/run_fuzzer.sh $<TARGET_FILE:${name}>
                     ${corpus} ${dict} ${POSENC_FUZZ_SECONDS} ${PROJECT_BINARY_DIR}/fuzz/${name})
    set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 3600)
  endif()
endfunction()
