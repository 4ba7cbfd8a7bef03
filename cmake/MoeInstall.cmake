# Install: libmoe.so (SONAME libmoe.so.0), libmoe.a, abi/moe.h, a CMake package and moe.pc.
include(CMakePackageConfigHelpers)
install(TARGETS moe moe_static EXPORT moeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/abi/moe.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# moe_deps is build-only (BUILD_INTERFACE); the static archive's link needs are re-found by moeConfig.
install(EXPORT moeTargets NAMESPACE moe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moe)
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/moeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/moeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moe)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/moeConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/moeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/moeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moe)
# moe.pc is written at install time so that its prefix is the one installed to (cmake --install --prefix).
install(CODE "
  set(PROJECT_VERSION \"${PROJECT_VERSION}\")
  set(CMAKE_INSTALL_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(CMAKE_INSTALL_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  configure_file(\"${CMAKE_CURRENT_SOURCE_DIR}/cmake/moe.pc.in\" \"${CMAKE_CURRENT_BINARY_DIR}/moe.pc\" @ONLY)
")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/moe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
