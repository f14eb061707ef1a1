# Everything `cmake --install` puts in place, in one file (included last, once
# every target exists).
#
# Consumers see posenc::client (with posenc::types, posenc::wire and
# posenc::proto); posenc::kernels (and posenc::cuda) are there for those who
# run kernels in-process, and only they need CUDA.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS posenc-server posenc-cli posenc-loadgen RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set_target_properties(posenc_client PROPERTIES EXPORT_NAME client)
set_target_properties(posenc_types PROPERTIES EXPORT_NAME types)
set_target_properties(posenc_wire PROPERTIES EXPORT_NAME wire)
set_target_properties(posenc_proto PROPERTIES EXPORT_NAME proto)
install(TARGETS posenc_client posenc_types posenc_wire posenc_proto EXPORT posencTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set_target_properties(posenc_kernels PROPERTIES EXPORT_NAME kernels)
set(posenc_kernel_targets posenc_kernels)
if(POSENC_HAVE_CUDA)
  set_target_properties(posenc_cuda PROPERTIES EXPORT_NAME cuda)
  list(APPEND posenc_kernel_targets posenc_cuda)
endif()
install(TARGETS ${posenc_kernel_targets} EXPORT posencKernelTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/posenc ${PROJECT_SOURCE_DIR}/kernels/include/posenc
                  ${PROJECT_SOURCE_DIR}/wire/include/posenc
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The .proto files, for clients in other languages and for grpcurl (posenc.v1
# and the KServe v2 protocol the server also speaks).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/posenc ${PROJECT_SOURCE_DIR}/proto/kserve
        DESTINATION ${CMAKE_INSTALL_DATADIR}/posenc/proto FILES_MATCHING PATTERN "*.proto")
install(FILES ${PROJECT_BINARY_DIR}/proto/posenc/v1/posenc.pb.h
              ${PROJECT_BINARY_DIR}/proto/posenc/v1/posenc.grpc.pb.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/posenc/v1)
install(EXPORT posencTargets NAMESPACE posenc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/posenc)
install(EXPORT posencKernelTargets NAMESPACE posenc::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/posenc)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/posencConfig.cmake.in
  ${PROJECT_BINARY_DIR}/posencConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/posenc)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/posencConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/posencConfig.cmake ${PROJECT_BINARY_DIR}/posencConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/posenc)
