# posenc_unit_test(<name> SOURCES <src>... LIBS <lib>... [DEFINES <def>...]
#                  [INCLUDES <dir>...] [PREFIX <prefix>])
#
# One GoogleTest executable for one unit, beside its code: linked with
# gtest_main, its cases registered with ctest under the label cpu (names
# after PREFIX, for a twin of another unit's test over another library).
function(posenc_unit_test name)
  if(NOT POSENC_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "PREFIX" "SOURCES;LIBS;DEFINES;INCLUDES" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest_main)
  if(T_INCLUDES)
    target_include_directories(${name} PRIVATE ${T_INCLUDES})
  endif()
  if(T_DEFINES)
    target_compile_definitions(${name} PRIVATE ${T_DEFINES})
  endif()
  gtest_discover_tests(${name} TEST_PREFIX "${T_PREFIX}" PROPERTIES LABELS cpu DISCOVERY_TIMEOUT 60)
endfunction()
